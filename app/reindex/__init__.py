"""The admin side: what changes what a set serves, beside the request path (app.engine) and never
in it. Each set's admin wiring (set_admin), candidate uploads (uploads), reindex jobs and their lock
(jobs, reindexer), the memory budget every set's builds share (budget), rollback, the versions
kept (versions), and the full build behind a first slice (first_build).

It imports the engine; the engine never imports it (tests/test_layers.py).
"""
