/tmp/pa/perf_analyzer -m simple -i grpc -u 127.0.0.1:37245 --concurrency-range 4 -p 3000 --max-trials 10 -f benchmarks/results/perf_analyzer/grpc.csv 
