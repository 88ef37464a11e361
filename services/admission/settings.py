from shared.config import CommonSettings


class AdmissionSettings(CommonSettings):
    service_name: str = "admission"
    http_port: int = 8000
    dev_token: str = ""  # the embedded stack sets one; empty = no development token
    outbox_replay_window_s: int = 24 * 3600
    max_page_size: int = 500
