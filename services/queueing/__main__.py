from services.queueing.main import run

run()
