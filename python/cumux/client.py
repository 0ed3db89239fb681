"""The HTTP client: one method per endpoint of /v1/functions."""

import base64
import hashlib
import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

SAFETENSORS = "application/x-safetensors"


class FunctionError(Exception):
    """A request the server refused or failed: `status` is the HTTP status,
    `message` the server's text, `cuda_error` the CUDA error's name, if any."""

    def __init__(self, status, message, cuda_error=None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.cuda_error = cuda_error


def _pins(text):
    """SHA-256 fingerprints as `cumux serve` prints them (`sha256:AB:CD:…`;
    several comma-separated; prefix, colons and case optional)."""
    pins = []
    for one in text.split(","):
        hexa = one.strip()
        if hexa.lower().startswith("sha256:"):
            hexa = hexa[7:]
        hexa = hexa.replace(":", "").lower()
        if len(hexa) != 64:
            raise ValueError(f"{one!r} is not a SHA-256 fingerprint")
        pins.append(bytes.fromhex(hexa))
    return pins


class _PinnedConnection(http.client.HTTPSConnection):
    """HTTPS to a server whose certificate is one of `pins`, whatever name
    it gives (the pin names the server)."""

    pins = ()

    def connect(self):
        super().connect()
        der = self.sock.getpeercert(binary_form=True)
        if hashlib.sha256(der).digest() not in self.pins:
            self.sock.close()
            raise ssl.SSLError(
                "the server's certificate is not the one CUMUX_TLS_FINGERPRINT pins")


class _PinnedHandler(urllib.request.HTTPSHandler):
    def __init__(self, pins):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        super().__init__(context=context)
        self._pins = pins
        self._context = context

    def https_open(self, req):
        pins = self._pins

        class Connection(_PinnedConnection):
            pass

        Connection.pins = pins
        return self.do_open(Connection, req, context=self._context)


class Client:
    """A client of one server's functions API, as the tenant `token` names.
    Over https it trusts the certificate `fingerprint` pins (as `cumux serve`
    prints it) or one the CA in the PEM file `ca` signed; by default what
    CUMUX_TLS_FINGERPRINT or CUMUX_TLS_CA say."""

    def __init__(self, url, token, timeout=600.0, fingerprint=None, ca=None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        fingerprint = fingerprint or os.environ.get("CUMUX_TLS_FINGERPRINT") or None
        ca = ca or os.environ.get("CUMUX_TLS_CA") or None
        if self.url.startswith("https://"):
            if fingerprint:
                handler = _PinnedHandler(_pins(fingerprint))
            elif ca:
                handler = urllib.request.HTTPSHandler(
                    context=ssl.create_default_context(cafile=ca))
            else:
                raise ValueError(
                    f"{url}: give fingerprint= (or CUMUX_TLS_FINGERPRINT) or ca= "
                    "(or CUMUX_TLS_CA) to trust the server")
            self._opener = urllib.request.build_opener(handler)
        elif self.url.startswith("http://"):
            self._opener = urllib.request.build_opener()
        else:
            raise ValueError(f"{url}: expected http:// or https://")

    def _request(self, method, path, body=None, content_type=None, accept=None):
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        if content_type:
            request.add_header("Content-Type", content_type)
        if accept:
            request.add_header("Accept", accept)
        try:
            with self._opener.open(request, timeout=self.timeout) as reply:
                return reply.headers.get("Content-Type", ""), reply.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                doc = json.loads(text)
                raise FunctionError(e.code, doc.get("error", ""), doc.get("cuda_error")) from None
            except ValueError:
                raise FunctionError(e.code, text.decode("utf-8", "replace")) from None

    def _json(self, method, path, doc=None):
        body = None if doc is None else json.dumps(doc).encode()
        _, reply = self._request(method, path, body, "application/json" if body else None)
        return json.loads(reply)

    def register(self, name, module, plan, device=None, invokers=()):
        """Registers (or replaces) function `name`: `module` is PTX text (str)
        or a cubin or fat binary (bytes); `plan` a dict; `invokers` other
        tenants that may invoke it. Its description."""
        doc = {"plan": plan, "invokers": list(invokers)}
        if isinstance(module, str):
            doc["module"] = module
        else:
            doc["module_base64"] = base64.b64encode(bytes(module)).decode()
        query = "?" + urllib.parse.urlencode({"device": device}) if device else ""
        return self._json("PUT", f"/v1/functions/{urllib.parse.quote(name)}{query}", doc)

    def list(self):
        """The tenant's functions, described."""
        return self._json("GET", "/v1/functions")["functions"]

    def remove(self, name):
        return self._json("DELETE", f"/v1/functions/{urllib.parse.quote(name)}")

    def invoke(self, name, params=None, deadline_ms=None, **inputs):
        """Invokes `name` with numpy arrays as its inputs and `params` (a dict
        of numbers); its outputs as numpy arrays, by name."""
        arrays = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        metadata = {k: json.dumps(v) for k, v in (params or {}).items()}
        body = save_tensors(arrays, metadata=metadata or None)
        query = f"?deadline_ms={int(deadline_ms)}" if deadline_ms else ""
        path = f"/v1/functions/{urllib.parse.quote(name)}/invoke{query}"
        _, reply = self._request("POST", path, body, SAFETENSORS, SAFETENSORS)
        return load_tensors(reply)
