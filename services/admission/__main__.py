from services.admission.main import run

run()
