"""``train``'s first lines: the Ray cluster, its dashboard, and how to get the token its dashboard asks for."""

from __future__ import annotations

from bridge_ray.commands.train import ray_lines


def test_the_dashboard_and_the_token_command_are_named():
    lines = ray_lines("10.0.0.1:6379", "127.0.0.1:8265", token_auth=True)
    assert lines[0] == "Ray: 10.0.0.1:6379; dashboard: http://127.0.0.1:8265"
    assert len(lines) == 2 and "`ray get-auth-token`" in lines[1]


def test_without_token_auth_or_dashboard_nothing_is_promised():
    assert ray_lines("10.0.0.1:6379", "https://ray.example.org", token_auth=False) == [
        "Ray: 10.0.0.1:6379; dashboard: https://ray.example.org"
    ]
    assert ray_lines("10.0.0.1:6379", None, token_auth=False) == [
        "Ray: 10.0.0.1:6379; dashboard: none (Ray started without it)"
    ]
