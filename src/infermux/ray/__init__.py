"""Scale-out on Ray Serve (``pip install 'infermux[ray]'``): each model a Ray Serve deployment
whose replicas run infermux's own batcher and runtime, with infermux's front ends as the ingress
(``infermux serve --ray ADDRESS``). See ``docs/scale-out.md``.

Nothing here is imported unless ``--ray`` is given: Ray is an optional extra.
"""
