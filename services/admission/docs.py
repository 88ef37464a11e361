"""``/docs``: Swagger UI served from the swagger-ui-bundle package, so it works offline."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, from the swagger-ui-bundle-v2 package


async def _docs(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")


async def _redoc() -> RedirectResponse:
    return RedirectResponse("/docs")


def add_docs(app: FastAPI) -> None:
    """Serve Swagger UI and its assets (create the app with ``docs_url=None`` and
    ``redoc_url=None``); ``/redoc``, whose page would load ReDoc from a CDN and stay
    blank offline, sends the reader to ``/docs``."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")
    app.add_api_route("/docs", _docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", _redoc, methods=["GET"], include_in_schema=False)
