"""Where a bundle goes to work: answers in one process (`classify`), over HTTP on Ray Serve
(`serve`), over files on Ray Data (`raydata`, in the Ray session `ray_session` starts and
stops), and as a Triton Inference Server model repository (`triton`). The core (export,
parity, runtime) imports nothing from here, and nothing here imports Ray until it runs."""

# The largest batch a server forms from waiting requests: serve's replicas and Triton's
# dynamic batcher, one default for both.
DEFAULT_MAX_BATCH_SIZE = 16
