"""`invoke bench`: imageforge against one plain Dockerfile, on the sample upstream.

baseline  the plain Dockerfile (seed 002's line order) generated from a plan
rawjson   which BuildKit steps a `--progress rawjson` stream rebuilt
synthetic large synthetic stage graphs for planning at scale
report    the Markdown tables and the pass/fail targets
run       the whole benchmark: server, manifest, builds, timings, results.json
"""
