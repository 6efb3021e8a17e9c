"""`gpuslice top` in a real terminal (tmux): it draws the table in place on the alternate
screen, never clears the whole screen between frames, quits on `q`, and leaves the shell usable
with the terminal settings it found."""

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from conftest import artifact
from helpers import Holder, wait_until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


class Tmux:
    """A private tmux server (its own socket) running one bash in a 160x40 window."""

    def __init__(self, env, workdir):
        self.sock = f"gpuslice-top-{uuid.uuid4().hex[:8]}"
        self.env = env
        rc = workdir / "bashrc"
        rc.write_text("PS1='$ '\n")
        self.tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "40",
                  f"env -i {' '.join(shlex.quote(f'{k}={v}') for k, v in env.items())} "
                  f"bash --noprofile --rcfile {shlex.quote(str(rc))} -i")

    def tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              check=True, stdin=subprocess.DEVNULL).stdout

    def send(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "t")

    def alternate_on(self):
        return self.tmux("display-message", "-p", "-t", "t", "#{alternate_on}").strip() == "1"

    def settings(self, tag):
        """The shell's terminal modes (`icanon`/`-icanon`, `echo`/`-echo`) as the shell sees
        them; proves the shell reads and runs a command."""
        # The marker is computed by the shell, so only the command's output contains it.
        self.send(f"echo $(stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)') M$((40+2)){tag}", "Enter")
        mark = f"M42{tag}"
        line = wait_until(lambda: next((l for l in self.screen().splitlines()
                                         if l.rstrip().endswith(mark) and "$((" not in l), None), timeout=20)
        assert line, self.screen()
        return line.rstrip()[:-len(mark)].split()

    def kill(self):
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


def test_top_draws_in_place_and_quits_on_q(profile_dir, gpu_env, burn, tmp_path):
    gpuslice = artifact(profile_dir, "gpuslice")
    env = gpu_env(memory="16Gi")
    wrapped = gpu_env(memory="16Gi", preload=True, GPUSLICE_SLICE="tenant", GPUSLICE_MEMORY="2Gi")
    env["TERM"] = "xterm-256color"
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    raw = tmp_path / "pane.raw"
    t = Tmux(env, tmp_path)
    try:
        with Holder(burn, wrapped, "512Mi") as h:
            assert wait_until(lambda: t.screen().rstrip().endswith("$"), timeout=20), t.screen()
            before = t.settings("before")
            t.tmux("pipe-pane", "-o", "-t", "t", f"cat >> {shlex.quote(str(raw))}")
            t.send(f"{shlex.quote(str(gpuslice))} top --interval 200", "Enter")

            def table():
                s = t.screen()
                return s if ("tenant" in s and "512 MiB / 2 GiB" in s and str(h.pid) in s) else None
            shown = wait_until(table, timeout=20)
            assert shown, t.screen()
            assert t.alternate_on(), "top draws on the alternate screen"
            assert "q: quit" in shown and "SLICE" in shown and "GPU" in shown, shown
            time.sleep(1.0)  # a few refreshes
            t.send("q")
            assert wait_until(lambda: not t.alternate_on(), timeout=10), t.screen()
            t.tmux("pipe-pane", "-t", "t")

            # The shell answers, with the terminal settings it had before top.
            after = t.settings("after")
            assert after == before, (before, after)
            assert "icanon" in after and "echo" in after, after
            assert "tenant" not in t.screen(), "the table went away with the alternate screen"

            # pipe-pane copies asynchronously: wait for the last sequence top writes.
            out = wait_until(lambda: (lambda b: b if b"\x1b[?1049l" in b else None)(raw.read_bytes()),
                             timeout=10) or raw.read_bytes()
            assert b"\x1b[?1049h" in out and b"\x1b[?1049l" in out, "alternate screen entered and left"
            assert b"\x1b[?25l" in out and b"\x1b[?25h" in out, "cursor hidden and shown again"
            assert out.count(b"\x1b[H") >= 3, "several frames were drawn"
            assert b"\x1b[2J" not in out, "frames overwrite in place, never clear the whole screen"
    finally:
        t.kill()


def ppid(pid):
    """Parent pid of `pid` (field 4 of /proc/<pid>/stat), or None when it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def test_top_restores_the_terminal_when_terminated(profile_dir, gpu_env, tmp_path):
    gpuslice = artifact(profile_dir, "gpuslice")
    env = gpu_env(memory="16Gi")
    env["TERM"] = "xterm-256color"
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    t = Tmux(env, tmp_path)
    try:
        assert wait_until(lambda: t.screen().rstrip().endswith("$"), timeout=20), t.screen()
        before = t.settings("before")
        shell = int(t.tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
        t.send(f"{shlex.quote(str(gpuslice))} top", "Enter")
        assert wait_until(lambda: "q: quit" in t.screen(), timeout=20), t.screen()
        # The shell's foreground child is top: terminate it as `kill` or a supervisor would.
        children = [pid for pid in os.listdir("/proc") if pid.isdigit() and ppid(pid) == shell]
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGTERM)
        assert wait_until(lambda: not t.alternate_on(), timeout=10), t.screen()
        assert t.settings("after") == before
    finally:
        t.kill()
