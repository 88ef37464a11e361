"""/docs works offline: Swagger UI's script and stylesheet are served by the gateway
itself (from the swagger-ui-bundle-v2 package), not loaded from a CDN (issue 19)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from shared.db import make_engine


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # no database: the engine connects lazily and /docs never touches it
    engine = make_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none", pool_size=1)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(), engine, ready)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as client:
        yield client
    await engine.dispose()


async def test_docs_reference_no_external_host_and_their_assets_answer(
        http: httpx.AsyncClient) -> None:
    r = await http.get("/docs")
    assert r.status_code == 200
    page = r.text
    assert "SwaggerUIBundle" in page
    # nothing absolute: every script, stylesheet and icon comes from this gateway
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), page
    assert "cdn.jsdelivr.net" not in page and "unpkg.com" not in page
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    js = [a for a in assets if a.endswith(".js")]
    css = [a for a in assets if a.endswith(".css")]
    assert js and css, assets
    for url in assets:
        got = await http.get(url)
        assert got.status_code == 200, url
        assert got.content, url
    assert len((await http.get(js[0])).content) > 100_000  # the real bundle
    assert "javascript" in (await http.get(js[0])).headers["content-type"]
    assert "text/css" in (await http.get(css[0])).headers["content-type"]
    # the OpenAPI document the page loads is served too
    openapi = re.search(r"""url: ['"]([^'"]+)['"]""", page)
    assert openapi and openapi[1] == "/openapi.json"
    assert (await http.get(openapi[1])).json()["info"]["title"] == "Kairos gateway"


async def test_redoc_which_would_load_from_a_cdn_sends_the_reader_to_docs(
        http: httpx.AsyncClient) -> None:
    r = await http.get("/redoc")
    assert r.status_code == 307 and r.headers["location"] == "/docs"
    assert "/redoc" not in (await http.get("/openapi.json")).json()["paths"]
