"""The viewer's HTTP routes, one module per group, each a `router(...)` that returns a FastAPI
`APIRouter` for `create_app` (`app.py`) to include: `page.py` the page and its static files,
`attention.py` /api/model and /api/attention, `generate.py` /api/generate (server-sent
events), `interventions.py` /api/heads and /api/lens, `routing.py` /api/routing.

Every module imports FastAPI and pydantic at the top, so only `create_app` imports them,
when it builds an app. What the routes share (limits, request checks, the model lock) is
`state.py`'s; what their answers hold, `payloads.py`'s; the error format, `errors.py`'s.
"""
