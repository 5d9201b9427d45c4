"""`make bench` and `make bench-peers`: start servers (pagedserve, llama.cpp's llama-server, transformers serve) on
free local ports, run the standard suite against each with the bench client, stop them, compare.

    python -m pagedserve.benchmarks.peers --servers pagedserve                          # make bench
    python -m pagedserve.benchmarks.peers --servers pagedserve,llama.cpp,transformers   # make bench-peers
"""
