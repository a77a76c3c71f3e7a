"""llguidance is loaded only where a constraint is built or compiled: importing the gateway
app (its handlers, converters and admin routes) does not load it, and converting a request
without a constraint does not either; the first constrained request does."""
from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import radixgate.gateway.app
from radixgate.gateway.openai.convert import convert_chat_request
from radixgate.gateway.openai.schemas import ChatCompletionRequest
plain = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
convert_chat_request(plain)
print("after_import", "llguidance" in sys.modules)
schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
constrained = plain.model_copy(update={"response_format": schema})
constrained = ChatCompletionRequest.model_validate(constrained.model_dump(exclude_none=True))
assert convert_chat_request(constrained).constraint is not None
print("after_constraint", "llguidance" in sys.modules)
"""


def test_importing_the_app_does_not_load_llguidance():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["after_import", "False", "after_constraint", "True"]
