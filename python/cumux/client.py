"""The HTTP client: one method per endpoint of /v1/functions."""

import base64
import json
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


class Client:
    """A client of one server's functions API, as the tenant `token` names."""

    def __init__(self, url, token, timeout=600.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method, path, body=None, content_type=None, accept=None):
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        if content_type:
            request.add_header("Content-Type", content_type)
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
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
