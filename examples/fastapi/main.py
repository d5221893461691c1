"""The web producer: ``POST /users/{id}/sync`` queues the user's sync once.

    uvicorn main:app

A request while the user's job waits or runs gets that job's id back, with
``"duplicate": true``, and queues nothing.
"""

from celery.result import AsyncResult
from fastapi import FastAPI
from jobs import app as celery_app
from jobs import sync_user

from celery_redislock import AlreadyQueued

app = FastAPI(title="celery_redislock unique jobs")


@app.post("/users/{user_id}/sync", status_code=202)
def sync(user_id: int) -> dict:
    try:
        job = sync_user.delay(user_id)
    except AlreadyQueued as exc:
        return {"user_id": user_id, "job_id": exc.task_id, "duplicate": True}
    return {"user_id": user_id, "job_id": job.id, "duplicate": False}


@app.get("/jobs/{job_id}")
def job(job_id: str) -> dict:
    result = AsyncResult(job_id, app=celery_app)
    return {
        "job_id": job_id,
        "state": result.state,
        "result": result.result if result.successful() else None,
    }
