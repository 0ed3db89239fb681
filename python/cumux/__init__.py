"""Client of cumux's serverless GPU functions (`cumux serve --functions`).

    import numpy as np, cumux
    c = cumux.Client("http://127.0.0.1:8700", token)
    c.register("vadd", module=open("vadd.ptx").read(), plan={...}, device="cpu")
    out = c.invoke("vadd", a=np.ones(4, np.float32), b=np.ones(4, np.float32))
    out["c"]  # a numpy array

Inputs and outputs travel as safetensors (a small JSON header, then raw
bytes); scalar parameters go in its metadata. Every failure raises
`cumux.FunctionError` with the HTTP status and the server's message.
"""

from .client import Client, FunctionError

__all__ = ["Client", "FunctionError"]
