"""The run's network policy: proxies, trusted CAs and TLS verification, resolved once, for every request."""

from __future__ import annotations

import ipaddress
import os
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

# Where a private CA may be named, in the order they are honoured after --ca-bundle (a file of PEM
# certificates); SSL_CERT_DIR names a folder of hashed certificates (OpenSSL's c_rehash).
CA_FILE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")
CA_DIR_VARIABLE = "SSL_CERT_DIR"


@dataclass(frozen=True, slots=True)
class Proxy:
    """One forward proxy: where it listens and which variable named it (for error lines)."""

    url: str
    host: str
    port: int
    variable: str

    @property
    def label(self) -> str:
        """``proxy http://10.0.0.1:3128 (HTTPS_PROXY)``: how every error line names it."""
        return f"proxy {self.url} ({self.variable})" if self.variable else f"proxy {self.url}"


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """How every request of a run reaches a server (preflight, load, metrics poller): the proxies of
    the environment (``NO_PROXY`` applied), the CA bundle or folder, and whether certificates are checked.

    Resolved once where the settings are made and sent to every worker with them (no environment
    lookup per request); ``*_var`` name the variable each value came from, for the error lines."""

    http_proxy: str = ""
    http_proxy_var: str = ""
    https_proxy: str = ""
    https_proxy_var: str = ""
    no_proxy: str = ""
    ca_file: str = ""
    ca_file_source: str = ""  # --ca-bundle or the variable that named it
    ca_dir: str = ""
    verify_tls: bool = True

    @classmethod
    def from_env(
        cls, *, ca_bundle: str | None = None, verify_tls: bool = True, env: Mapping[str, str] | None = None
    ) -> NetworkPolicy:
        """The policy of this process's environment (lower-case variables first, as urllib reads them:
        docs/sources.md §16) with ``--ca-bundle`` and ``--insecure`` applied."""
        env = os.environ if env is None else env
        http, http_var = _variable(env, "http_proxy")
        https, https_var = _variable(env, "https_proxy")
        no_proxy, _ = _variable(env, "no_proxy")
        ca_file, ca_source = (os.path.abspath(ca_bundle), "--ca-bundle") if ca_bundle else ("", "")
        for name in CA_FILE_VARIABLES if not ca_file else ():
            if env.get(name):
                ca_file, ca_source = env[name], name
                break
        return cls(
            http_proxy=_with_scheme(http),
            http_proxy_var=http_var,
            https_proxy=_with_scheme(https),
            https_proxy_var=https_var,
            no_proxy=no_proxy,
            ca_file=ca_file,
            ca_file_source=ca_source,
            ca_dir=env.get(CA_DIR_VARIABLE, ""),
            verify_tls=verify_tls,
        )

    def direct(self) -> NetworkPolicy:
        """The policy without proxies (the embedded engine, on this host)."""
        return replace(self, http_proxy="", http_proxy_var="", https_proxy="", https_proxy_var="")

    def check(self) -> str:
        """Why this policy cannot be used ("" when it can): a CA bundle that is not a readable file."""
        if self.ca_file and not os.path.isfile(self.ca_file):
            return f"{self.ca_file_source} {self.ca_file}: no such file (a PEM file of CA certificates)"
        for url, var in ((self.http_proxy, self.http_proxy_var), (self.https_proxy, self.https_proxy_var)):
            if url:
                u = urlsplit(url)
                if u.scheme != "http" or not u.hostname:
                    return f"{var}={url}: a proxy is given as http://HOST:PORT"
                if u.username or u.password:
                    return f"{var}: a proxy with credentials in its URL is not supported (docs/network.md)"
        return ""

    def proxy_for(self, url: str) -> Proxy | None:
        """The proxy a request to ``url`` goes through, or None (no proxy for its scheme, or NO_PROXY)."""
        u = urlsplit(url)
        scheme = u.scheme or "http"
        proxy, var = (
            (self.https_proxy, self.https_proxy_var)
            if scheme == "https"
            else (self.http_proxy, self.http_proxy_var)
        )
        if not proxy or not u.hostname:
            return None
        port = u.port or (443 if scheme == "https" else 80)
        if self.no_proxy and bypassed(u.hostname, port, self.no_proxy):
            return None
        p = urlsplit(proxy)
        return Proxy(f"http://{p.hostname}:{p.port or 80}", p.hostname or "", p.port or 80, var)

    def ssl_context(self, create: Callable[..., Any] = ssl.create_default_context) -> Any:
        """A client TLS context: the CA bundle or folder when given (else the system's), none of it
        checked with --insecure. ``create``: gevent's factory for the load client."""
        ctx = create(cafile=self.ca_file or None, capath=self.ca_dir or None)
        if not self.verify_tls:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def opener(self, url: str) -> urllib.request.OpenerDirector:
        """A urllib opener for ``url`` under this policy (the preflight and the metrics poller)."""
        proxy = self.proxy_for(url)
        scheme = urlsplit(url).scheme or "http"
        handlers: list[urllib.request.BaseHandler] = [
            urllib.request.ProxyHandler({scheme: proxy.url} if proxy else {})
        ]
        if scheme == "https":
            ctx = _urllib_contexts.get(self)
            if ctx is None:
                ctx = _urllib_contexts[self] = self.ssl_context()
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        return urllib.request.build_opener(*handlers)

    def describe(self) -> dict[str, Any]:
        """What run.json says of the policy (no credentials: proxies with them are refused)."""
        return {
            "http_proxy": self.http_proxy or None,
            "https_proxy": self.https_proxy or None,
            "no_proxy": self.no_proxy or None,
            "ca_file": self.ca_file or None,
            "ca_dir": self.ca_dir or None,
            "tls_verify": self.verify_tls,
        }

    def to_data(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> NetworkPolicy:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


_urllib_contexts: dict[NetworkPolicy, ssl.SSLContext] = {}  # one per policy and process (the poller's ticks)


def unreachable(proxy: Proxy, target: str, why: object) -> str:
    """The one line for a proxy that could not be used: it names the proxy and its variable."""
    return (
        f"cannot reach {target} through {proxy.label}: {why} "
        f"(fix the proxy, or unset {proxy.variable or 'it'} / add the host to NO_PROXY)"
    )


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs share scheme, host and port (where a request's credentials may go)."""
    ua, ub = urlsplit(a if "://" in a else f"http://{a}"), urlsplit(b if "://" in b else f"http://{b}")
    default = {"http": 80, "https": 443}
    return (
        ua.scheme == ub.scheme
        and (ua.hostname or "") == (ub.hostname or "")
        and (ua.port or default.get(ua.scheme)) == (ub.port or default.get(ub.scheme))
    )


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` exempts ``host:port``: ``*``; a name matching the host or a domain it is in
    (a leading dot optional); an address or a CIDR block (``10.0.0.0/8``); an entry's ``:port`` must match."""
    host = host.lower().strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want_port and want_port != str(port):
            continue
        name = name.strip("[]").lstrip(".")
        if address is not None and "/" in name:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


def _variable(env: Mapping[str, str], name: str) -> tuple[str, str]:
    for n in (name, name.upper()):
        value = env.get(n, "").strip()
        if value:
            return value, n
    return "", ""


def _with_scheme(url: str) -> str:
    return url if not url or "://" in url else f"http://{url}"
