/tmp/pa/perf_analyzer -m simple -i http -u 127.0.0.1:45703 --concurrency-range 4 -p 3000 --max-trials 10 -f benchmarks/results/perf_analyzer/http.csv 
