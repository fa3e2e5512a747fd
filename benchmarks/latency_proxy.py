"""A TCP proxy that holds every chunk a client sends for a fixed time before passing it on: in
front of the loopback S3 server, each request then waits as it would for a distant server.

    python -m benchmarks.latency_proxy LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_SECONDS

Prints ``ready`` once it accepts connections. A small request (one chunk) is delayed once;
the server's answers pass at once. Uploads are delayed per 64 KiB chunk, so send builds to the
server directly.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listen: int, host: str, port: int, delay: float) -> None:
    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer, delay),
                             _pipe(server_reader, client_writer, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    listen, host, port, delay = argv or sys.argv[1:]
    asyncio.run(_serve(int(listen), host, int(port), float(delay)))


if __name__ == "__main__":
    main()
