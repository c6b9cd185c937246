"""The agent frameworks people point at a box, pinned and unmodified, against the session's real server (default
model): the OpenAI Agents SDK (`openai-agents`) through the Responses API and through chat completions, and
LangChain's `ChatOpenAI` (`langchain-openai`) with tools bound, streamed, and structured output; `instructor` in
its tools and JSON-schema modes (from a venv of its own: its pins and the suite's openai do not meet). The model is
small: the tests prove the protocol (a call the framework parses and runs, an answer it accepts), not wisdom."""

from __future__ import annotations

import asyncio

import openai
import pytest
from pydantic import BaseModel

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system


def _agents():
    import agents

    agents.set_tracing_disabled(True)  # its exporter would post traces to OpenAI's servers
    return agents


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_openai_agents_sdk_agent_calls_our_tool_and_finishes(server, api_key, api):
    agents = _agents()
    box = openai.AsyncOpenAI(base_url=server + "/v1", api_key=api_key[1], max_retries=0, timeout=120)
    model = (agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel)(
        model=MODEL_ID, openai_client=box)
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"It is sunny in {city}."

    agent = agents.Agent(name="weather", instructions="Answer with the weather tool.", model=model,
                         tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=64))
    plain = agents.Agent(name="plain", instructions="Answer briefly.", model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=256))

    async def both():  # one event loop: the client's connections belong to it
        return (await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2),
                await agents.Runner.run(plain, "Say hello.", max_turns=1))

    result, answer = asyncio.run(both())
    # The SDK parsed the box's function call, ran our function with its arguments, and ended on its output.
    assert len(asked) == 1 and isinstance(asked[0], str)
    assert result.final_output == f"It is sunny in {asked[0]}."
    assert isinstance(answer.final_output, str) and answer.final_output.strip()


class Trip(BaseModel):
    city: str
    days: int


def test_langchain_chat_openai_binds_tools_streams_and_gives_structured_output(server, api_key):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    chat = ChatOpenAI(model=MODEL_ID, base_url=server + "/v1", api_key=api_key[1], temperature=0, max_tokens=64,
                      max_retries=0, timeout=120)
    called = chat.bind_tools([get_weather], tool_choice="required").invoke("What is the weather in Paris?")
    assert len(called.tool_calls) >= 1 and called.tool_calls[0]["name"] == "get_weather"
    assert isinstance(called.tool_calls[0]["args"].get("city"), str)
    assert get_weather.invoke(called.tool_calls[0]["args"]) == "sunny"  # the args are the tool's own

    streamed = None
    for piece in chat.bind_tools([get_weather], tool_choice="required").stream("Weather in Rome?"):
        streamed = piece if streamed is None else streamed + piece
    assert streamed.tool_calls and streamed.tool_calls[0]["name"] == "get_weather"

    trip = chat.with_structured_output(Trip, method="json_schema").invoke("Plan a trip: a city and a number of days.")
    assert isinstance(trip, Trip)
    text = "".join(c.content for c in chat.stream("Say hello."))
    assert text.strip()


# instructor caps jiter below 0.15, which the openai pinned for the suite (3.51.0) needs from 0.16: it runs from a
# venv of its own, with the newest openai it accepts, both pinned.
INSTRUCTOR = ("instructor==1.17.0", "openai==3.3.0")
INSTRUCTOR_SCRIPT = r'''
import json, sys
import instructor
from openai import OpenAI
from pydantic import BaseModel

class Trip(BaseModel):
    city: str
    days: int

base, key, model = sys.argv[1:4]
out = {}
for mode in ("TOOLS", "JSON_SCHEMA"):
    client = instructor.from_openai(OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120),
                                    mode=getattr(instructor.Mode, mode))
    trip = client.chat.completions.create(model=model, response_model=Trip, max_retries=0, max_tokens=64,
                                          temperature=0, messages=[{"role": "user",
                                                                    "content": "Plan a trip: a city and a number of days."}])
    out[mode] = trip.model_dump()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def instructor_python() -> str:
    """The Python of a venv holding the pinned instructor (created once per pin set, in ~/.cache/everycycle)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    cache = Path(os.environ.get("EVERYCYCLE_CACHE", Path.home() / ".cache" / "everycycle"))
    venv = cache / "py-clients" / "-".join(p.replace("==", "-") for p in INSTRUCTOR)
    python = venv / "bin" / "python"
    if not (venv / "ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *INSTRUCTOR], check=True, timeout=900)
        (venv / "ready").touch()
    return str(python)


def test_instructor_gets_a_validated_model_in_tools_and_json_schema_modes(server, api_key, instructor_python):
    """instructor (pinned, unmodified, in its own venv) asks for a pydantic model through a forced tool call and
    through response_format json_schema: both come back as a Trip it validated."""
    import json
    import subprocess

    done = subprocess.run([instructor_python, "-c", INSTRUCTOR_SCRIPT, server + "/v1", api_key[1], MODEL_ID],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trips = json.loads(done.stdout)
    for mode in ("TOOLS", "JSON_SCHEMA"):
        assert isinstance(trips[mode]["city"], str) and isinstance(trips[mode]["days"], int), trips
