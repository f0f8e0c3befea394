"""``infermux bench``: a load generator for any KServe V2 server (infermux, Triton, MLServer...).

Closed-loop concurrency sweeps and open-loop request-rate sweeps over HTTP, gRPC and system
shared memory, measured in windows until stable, with percentiles, the server's own queue and
compute breakdown (statistics extension), its own CPU use, and JSON / CSV / plot output. The
load comes from worker processes (``--processes``), the coordinator only measures.
"""
