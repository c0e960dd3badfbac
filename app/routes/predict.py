"""Prediction mode's one question to the server: what does the next step add to the pools?
(/walkthroughs/<name>/steps/<n>/next.json, and the same for a learner's program at /programs/…).
The page asks it before stepping on, lets the learner guess, and draws the answer over the guess
once the next step is shown (static/predict.js)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import Traces
from app.lessons.predict import next_step
from app.routes.walkthroughs import DEBUGGER, AtStop

router = APIRouter()


@router.get(DEBUGGER + "/steps/{n}/next.json")
def next_json(stop: AtStop, cache: Traces) -> JSONResponse:
    """The objects step n + 1 adds to the contexts' pools: where each lands, and for a tensor
    its data offset, size and shape ({"step": null} after the last step)."""
    k = stop.step.index
    after = cache.state(stop.trace, k + 1) if k + 1 < len(stop.trace.steps) else None
    return JSONResponse(asdict(next_step(stop.trace, k, after)), headers={"Cache-Control": "no-store"})
