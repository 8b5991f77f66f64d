"""Locust's web login for `loadtest ui`: one user whose credentials come from the environment."""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING, Any

from flask import request

if TYPE_CHECKING:
    from werkzeug.wrappers import Response as WerkzeugResponse


def install_login(web_ui: Any, user: str, password: str) -> None:
    """Locust's web login with one user: its login page posts to /llm/login, which checks the credentials."""
    from flask import redirect, session, url_for
    from flask_login import UserMixin, login_user

    class _Operator(UserMixin):
        def __init__(self, name: str) -> None:
            self.id = name

    # Sessions need a key; without one Locust's login check fails open (it logs and serves the page).
    web_ui.app.secret_key = secrets.token_bytes(32)
    web_ui.login_manager.user_loader(lambda uid: _Operator(uid) if uid == user else None)
    web_ui.auth_args = {"username_password_callback": "/llm/login"}

    @web_ui.app.route("/llm/login", methods=["POST"])
    def llm_login() -> WerkzeugResponse:  # flask.redirect's type
        ok_user = hmac.compare_digest(request.form.get("username", ""), user)
        ok_password = hmac.compare_digest(request.form.get("password", ""), password)
        if ok_user and ok_password:
            login_user(_Operator(user))
            return redirect(url_for("locust.index"))
        session["auth_error"] = "Invalid username or password"
        return redirect(url_for("locust.login"))
