"""The command line's own parsing (cli/main.py): overrides may follow options."""

import io

import pytest
import yaml

from scone_jax.cli.main import main, whole_lines


def test_overrides_after_an_option_are_overrides_and_anything_else_is_refused(capsys):
    assert main(["train", "tiny", "--print-config", "train.steps=3", "model.n_layers=1"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 3 and printed["model"]["n_layers"] == 1
    for stray in (["--bogus"], ["stray"]):
        with pytest.raises(SystemExit) as e:
            main(["train", "tiny", "--print-config", *stray])
        assert e.value.code == 2
        assert f"unrecognized arguments: {stray[0]}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a command without overrides takes none
        main(["report", "runs/x", "train.steps=3"])
    assert "unrecognized arguments: train.steps=3" in capsys.readouterr().err


class TeardownSkipped(Exception):
    pass


@pytest.mark.parametrize("code", [130, 143])
@pytest.mark.parametrize("joined", [False, True], ids=["one process", "multi-process"])
def test_a_command_a_signal_stopped_skips_the_teardown_unless_peers_wait(monkeypatch, code, joined):
    """The interpreter's teardown can crash (SIGSEGV) after a signal that came while XLA was
    compiling; a multi-process job's process must still run its watchdog's exit handler."""
    import scone_jax.cli.main as main_module

    def skip_teardown(status):
        raise TeardownSkipped(status)

    monkeypatch.setattr(main_module, "main", lambda: code)
    monkeypatch.setattr(main_module.distributed, "joined", lambda: joined)
    monkeypatch.setattr(main_module.os, "_exit", skip_teardown)
    with pytest.raises(SystemExit if joined else TeardownSkipped) as e:
        main_module.entry()
    assert e.value.args[0] == code


def test_a_finished_command_exits_normally(monkeypatch):
    import scone_jax.cli.main as main_module

    monkeypatch.setattr(main_module, "main", lambda: 0)
    monkeypatch.setattr(main_module.os, "_exit", lambda c: pytest.fail("skipped the teardown"))
    with pytest.raises(SystemExit) as e:
        main_module.entry()
    assert e.value.code == 0


class RecordedFile(io.RawIOBase):
    """An unbuffered file that records each write it gets, as the file descriptor would."""

    def __init__(self):
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writes.append(bytes(data))
        return len(data)


@pytest.mark.parametrize("unbuffered", [True, False], ids=["PYTHONUNBUFFERED", "buffered"])
def test_each_printed_line_reaches_the_file_in_one_write(unbuffered):
    """Anything else writing to the same file (the C++ runtime) can only come between lines."""
    raw = RecordedFile()
    stream = (
        io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # how -u sets up stdout
        if unbuffered
        else io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    )
    if unbuffered:
        print("STEP 1", file=stream)
        assert raw.writes == [b"STEP 1", b"\n"]  # what let another writer in between
        raw.writes.clear()
    whole_lines(stream)
    print("STEP 2", file=stream)
    print("a", "b", file=stream)
    assert raw.writes == [b"STEP 2\n", b"a b\n"]  # whole, and at once: no flush was needed
