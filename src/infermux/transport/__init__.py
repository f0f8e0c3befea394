"""The process transport (``--frontends N > 1``): how front-end processes reach the executor.

Front-end side: ``remote_plane.RemoteDataPlane`` (the Operations a front end's HTTP and gRPC
servers call, spread over every executor), ``executor_client.RemoteExecutor`` (one executor over
one channel), ``grouping`` and ``micro_batcher`` (requests sent together). Executor side:
``channel_server.ChannelServer`` (every front end's channel into the one DataPlane). Both:
``link.Link`` (one end of a channel on the event loop), ``streams`` (a decoupled model's
responses, one frame each, and the credit that bounds them). The bytes and frames themselves
are ``infermux.ipc``.
"""
