from benchmarks.run_all import main

main()
