"""The Python client against a real `cumux serve --functions` (CUMUX_BIN, or
target/debug/cumux), on the CPU device: register, invoke, errors."""

import os
import pathlib
import re
import subprocess
import tempfile
import time

import numpy as np
import pytest

import cumux

ROOT = pathlib.Path(__file__).resolve().parents[2]
PTX = (ROOT / "tests/functions/kernels.ptx").read_text()
TOKEN = "py-tenant-token-0123456789"

VADD = {
    "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
    "params": [{"name": "k", "dtype": "f32", "default": 1}],
    "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
    "launches": [
        {"kernel": "vadd", "grid": "cdiv(a, 64)", "block": 64,
         "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"u32": "a"}]},
        {"kernel": "scale", "grid": "cdiv(a, 64)", "block": 64,
         "args": [{"buffer": "c"}, {"buffer": "c"}, {"f32": "k"}, {"u32": "a"}]},
    ],
}


@pytest.fixture(scope="module")
def server():
    binary = os.environ.get("CUMUX_BIN", str(ROOT / "target/debug/cumux"))
    folder = tempfile.mkdtemp()
    config = pathlib.Path(folder, "cumux.toml")
    config.write_text(f'[tenants.py]\ntoken = "{TOKEN}"\n')
    proc = subprocess.Popen(
        [binary, "serve", "--device", "cpu", "--memory", "1G", "--config", str(config),
         "--listen", f"unix:{folder}/s.sock", "--functions", "127.0.0.1:0"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    found = re.search(r"functions on (http://[^/]+)/", line)
    assert found, line
    yield found.group(1)
    proc.terminate()
    proc.wait(timeout=30)


def test_register_and_invoke_with_numpy(server):
    c = cumux.Client(server, TOKEN)
    c.register("vadd", PTX, VADD, device="cpu")
    assert [f["name"] for f in c.list()] == ["vadd"]
    a = np.arange(100, dtype=np.float32)
    out = c.invoke("vadd", a=a, b=a, params={"k": 0.5})
    np.testing.assert_array_equal(out["c"], a)


def test_errors_carry_status_and_place(server):
    c = cumux.Client(server, TOKEN)
    with pytest.raises(cumux.FunctionError) as e:
        c.invoke("vadd", a=np.ones(3, np.float32), b=np.ones(4, np.float32))
    assert e.value.status == 400 and "size mismatch" in e.value.message
    with pytest.raises(cumux.FunctionError) as e:
        cumux.Client(server, None).list()
    assert e.value.status == 401


def test_https_trusts_the_pinned_certificate_only(tmp_path):
    binary = os.environ.get("CUMUX_BIN", str(ROOT / "target/debug/cumux"))
    config = tmp_path / "cumux.toml"
    config.write_text(f'[tenants.py]\ntoken = "{TOKEN}"\n')
    # A reachable address gets the server's self-signed certificate.
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [binary, "serve", "--device", "cpu", "--memory", "1G", "--config", str(config),
         "--listen", f"unix:{tmp_path}/s.sock", "--functions", "0.0.0.0:0"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        found = re.search(r"functions on https://[^:]+:(\d+)/\S* \(certificate (sha256:[0-9A-F:]+)\)",
                          line)
        assert found, line
        url = f"https://127.0.0.1:{found.group(1)}"
        c = cumux.Client(url, TOKEN, fingerprint=found.group(2))
        assert c.list() == []
        wrong = "sha256:" + ":".join(["00"] * 32)
        with pytest.raises(Exception) as e:
            cumux.Client(url, TOKEN, fingerprint=wrong).list()
        assert "pins" in str(e.value)
        with pytest.raises(ValueError):
            cumux.Client(url, TOKEN, fingerprint=None, ca=None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
