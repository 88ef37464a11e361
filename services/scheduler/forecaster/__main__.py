from services.scheduler.forecaster.service import run

run()
