from services.scheduler.main import run

run()
