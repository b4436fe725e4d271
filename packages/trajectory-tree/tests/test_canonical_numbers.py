"""Numbers a JavaScript client re-serializes must not fork the tree."""

from trajectory_tree import Message, ToolCall, canonical_json, same_message


def test_integral_floats_equal_integers() -> None:
    assert canonical_json('{"timeout": 60000.0, "n": [2.0]}') == canonical_json(
        '{"n":[2],"timeout":60000}'
    )


def test_fractional_floats_still_distinguished() -> None:
    assert canonical_json('{"x": 1.5}') != canonical_json('{"x": 1}')


def test_echo_with_js_number_formatting_matches_reply() -> None:
    reply = Message(
        "assistant", (ToolCall("c1", "bash", '{"cmd": "sleep 1", "timeout": 60000.0}'),)
    )
    echo = Message("assistant", (ToolCall("c1", "bash", '{"cmd":"sleep 1","timeout":60000}'),))
    assert same_message(reply, echo)


def test_integral_floats_beyond_javascripts_safe_integers_stay_floats() -> None:
    """2**53 - 1 is the largest integer a JavaScript number holds exactly; from 2**53 on, a
    float may stand for several integers, so it is not turned into one."""
    assert canonical_json("[9007199254740991.0]") == "[9007199254740991]"
    assert canonical_json("[9007199254740992.0]") == "[9007199254740992.0]"
    assert canonical_json("[-9007199254740992.0]") == "[-9007199254740992.0]"
