from services.node_agent.main import run

run()
