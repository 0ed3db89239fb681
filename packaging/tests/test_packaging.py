"""The packaging agrees with the cumux it packages: every `cumux` command the
images and the Kubernetes manifest run names a subcommand and flags that
`cumux SUB --help` lists, the paths the device plugin mounts are the ones
the server and its defaults use, the manifest's server config is one
`cumux serve` starts with, and what the Dockerfiles copy exists."""
import os
import pathlib
import re
import subprocess
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CUMUX = os.environ.get("CUMUX_BIN", str(ROOT / "target/debug/cumux"))
MANIFEST = ROOT / "packaging/kubernetes/cumux.yaml"


def help_of(sub):
    return subprocess.run([CUMUX, sub, "--help"], capture_output=True, text=True, check=True).stdout


def check_command(args):
    """`args` (after `cumux`): its subcommand exists and each flag is listed."""
    sub, flags = args[0], [a for a in args[1:] if a.startswith("--")]
    text = help_of(sub)
    for flag in flags:
        assert re.search(rf"\s{re.escape(flag)}[\s<=]", text), f"cumux {sub} has no {flag}"


def manifest():
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_the_manifest_runs_commands_cumux_has():
    spec = manifest()["DaemonSet"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    check_command(containers["server"]["args"])
    check_command(containers["device-plugin"]["args"])
    probe = containers["server"]["readinessProbe"]["exec"]["command"]
    assert probe[0].endswith("/cumux")
    check_command(probe[1:])


def test_the_plugin_mounts_what_the_server_and_kubelet_use():
    spec = manifest()["DaemonSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    plugin = next(c for c in spec["containers"] if c["name"] == "device-plugin")
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    text = help_of("device-plugin")
    for name, default in [("device-plugins", "/var/lib/kubelet/device-plugins"),
                          ("pod-resources", "/var/lib/kubelet/pod-resources")]:
        assert volumes[name]["hostPath"]["path"] == default == mounts[name]
        assert default in text, f"the plugin's default is no longer {default}"
    args = plugin["args"]
    driver = args[args.index("--driver-dir") + 1]
    assert volumes["driver"]["hostPath"]["path"] == driver
    server = next(c for c in spec["containers"] if c["name"] == "server")
    listen = server["args"][server["args"].index("--listen") + 1]
    assert listen == args[args.index("--server") + 1]
    assert listen.startswith("unix:" + volumes["socket"]["hostPath"]["path"] + "/")


def test_the_manifest_config_starts_a_server():
    config = manifest()["ConfigMap"]["data"]["cumux.toml"]
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "cumux.toml"
        path.write_text(config)
        sock = pathlib.Path(d) / "s.sock"
        server = subprocess.Popen([CUMUX, "serve", "--config", str(path), "--device", "cpu",
                                   "--listen", f"unix:{sock}"], stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while not sock.exists() and server.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            assert sock.exists(), f"cumux serve did not start: {server.stderr.read() if server.poll() is not None else 'timeout'}"
            subprocess.run([CUMUX, "status", "--server", f"unix:{sock}"], check=True, capture_output=True)
        finally:
            server.terminate()
            server.wait(timeout=60)


def test_the_images_copy_what_exists_and_run_commands_cumux_has():
    for name in ["Dockerfile.server", "Dockerfile.client"]:
        text = (ROOT / "packaging" / name).read_text()
        for src in re.findall(r"^COPY (?!--from)(\S+) ", text, re.M):
            assert (ROOT / src).exists() or src == ".", f"{name} copies {src}, which is missing"
        cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
        if cmd:
            check_command(yaml.safe_load(cmd.group(1)))
        for built in re.findall(r"target/release/(\S+) ", text):
            crate = {"cumux": "cumux-cli", "libcumux_client.so": "cumux-client",
                     "libcumux_nvml.so": "cumux-nvml"}[built]
            assert f"-p {crate}" in text, f"{name} copies {built} without building {crate}"
