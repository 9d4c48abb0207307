"""metrics.jsonl and tensorboard after a resume: the steps a killed run logged past its last
checkpoint are dropped from the log and hidden in tensorboard, so no step is drawn twice."""

from __future__ import annotations

import json
import struct

from tensorboardX.proto.event_pb2 import Event, SessionLog

from scone_jax.metrics.writers import MetricsWriter


def events(directory):
    """Every event of every tensorboard file in `directory` (TFRecord: length, its CRC, the
    record, its CRC), file by file in the order they were written."""
    out = []
    for path in sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        data, at, found = path.read_bytes(), 0, []
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            found.append(Event.FromString(data[at + 12 : at + 12 + length]))
            at += 12 + length + 4
        out.append(found)
    return out


def test_a_resume_drops_and_hides_the_steps_past_its_checkpoint(tmp_path, rng):
    killed_at, resumed_from = int(rng.integers(5, 9)), int(rng.integers(1, 5))
    print("killed at", killed_at, "resumed from", resumed_from)
    first = MetricsWriter(tmp_path, print_fn=lambda _: None)
    first.truncate_after(0)
    for step in range(1, killed_at + 1):
        first.write(step, {"loss": float(step)})
    first.close()
    again = MetricsWriter(tmp_path, print_fn=lambda _: None)
    again.truncate_after(resumed_from)
    for step in range(resumed_from + 1, killed_at + 3):
        again.write(step, {"loss": -float(step)})
    again.close()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, killed_at + 3))
    old, new = events(tmp_path / "tensorboard")
    starts = [e.step for e in new if e.session_log.status == SessionLog.START]
    assert starts == [resumed_from + 1]  # tensorboard hides the old file's steps from here on
    assert sorted(e.step for e in new if e.summary.value) == list(
        range(resumed_from + 1, killed_at + 3)
    )
