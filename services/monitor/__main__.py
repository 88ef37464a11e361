from services.monitor.main import run

run()
