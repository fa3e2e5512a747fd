"""A TCP proxy that holds every chunk a client sends for a fixed time before passing it on: in
front of the loopback S3 server, each request then waits as it would for a distant server.

    python -m benchmarks.latency_proxy LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_SECONDS [MB_PER_S]

Prints ``ready`` once it accepts connections. A small request (one chunk) is delayed once;
the server's answers pass at once, or at most at ``MB_PER_S`` (10**6 bytes a second) a
connection, as one S3 connection delivers (~100 MB/s). Uploads are delayed per 64 KiB chunk,
so send builds to the server directly.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float, rate: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    sent, since = 0, loop.time()
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if delay:
                await asyncio.sleep(delay)
            if rate:  # at most ``rate`` bytes a second; no credit for the time it was idle
                now = loop.time()
                if now > since + sent / rate:
                    sent, since = 0, now
                sent += len(data)
                ahead = since + sent / rate - now
                if ahead > 0:
                    await asyncio.sleep(ahead)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listen: int, host: str, port: int, delay: float, rate: float) -> None:
    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer, delay),
                             _pipe(server_reader, client_writer, 0.0, rate))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    listen, host, port, delay, *rate = argv or sys.argv[1:]
    asyncio.run(_serve(int(listen), host, int(port), float(delay),
                       float(rate[0]) * 1e6 if rate else 0.0))


if __name__ == "__main__":
    main()
