"""A worker thread's result drawn on the UI thread, or dropped where the widgets it draws on are gone."""

from __future__ import annotations

from textual.app import App
from textual.css.query import NoMatches


def draw_from_worker(node, draw, *args) -> None:
    """The console quitting takes its screens apart while their workers finish (a model header read over the
    network, a copy, a status read): a line that arrives then has nowhere to go, and NoMatches would fail the whole
    app (CI, stop 63 again: the wizard's verdict arrived with the wizard still attached, its verdict line removed)."""
    def on_ui_thread() -> None:
        try:
            draw(*args)
        except NoMatches:
            pass

    (node if isinstance(node, App) else node.app).call_from_thread(on_ui_thread)
