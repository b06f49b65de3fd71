#!/usr/bin/env python3
"""Example `--exec` handler for `runtime start --role worker`.

The worker runs this once per attempt: the task JSON arrives on stdin, the ids in TASK_ID,
ATTEMPT_ID, WORKER_ID and TASK_RERUN (1 when the worker crashed mid-run and this is the same
attempt again), and TASK_ANSWERS (a JSON array) on a resume. It prints one JSON object:
{"response": ...} to complete, or {"question": "...", "tool_call_id": "..."} to wait for an
answer. A non-zero exit fails the attempt with the tail of stderr.

This one echoes the task text; a text ending in "?" asks a question first and completes with
the answer on resume.
"""
import json
import os
import sys

task = json.load(sys.stdin)
answers = json.loads(os.environ.get("TASK_ANSWERS", "[]") or "[]")
text = task["text"]

if text.endswith("?") and not answers:
    print(json.dumps({"question": f"what should I answer to: {text}", "tool_call_id": "ask-1"}))
else:
    print(json.dumps({"response": {
        "echo": text,
        "answers": answers,
        "worker": os.environ["WORKER_ID"],
        "attempt": os.environ["ATTEMPT_ID"],
        "rerun": os.environ.get("TASK_RERUN") == "1",
    }}))
