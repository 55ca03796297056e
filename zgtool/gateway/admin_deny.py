"""/admin/* is never served through a public front that holds no keys: what each template uses
to refuse it (403). The engine routes on the percent-decoded path, so a front that matches
the raw path must also catch escaped forms (/%61dmin/); pygw checks admin keys itself."""

from __future__ import annotations

# the body of the 403, in the Anthropic error shape (both SDKs read it)
ADMIN_DENIED_MESSAGE = "/admin/* is not served through this gateway; use the engine port with an admin key"
ADMIN_DENIED_JSON = '{"type":"error","error":{"type":"permission_error","message":"' + ADMIN_DENIED_MESSAGE + '"}}'
# a raw request path (no query) whose decoded form starts with /admin/ or is /admin; leading
# slashes and ./ segments are allowed for, since a normalising upstream would fold them
ADMIN_RAW_PATH_RE = r"^(/|%2f|\./|%2e/)*(a|%61)(d|%64)(m|%6d)(i|%69)(n|%6e)(/|%2f|\?|$)"
