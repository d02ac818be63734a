"""Tools through specd-gateway rendered by Mistral-Nemo-Instruct-2407's chat
template (tests/data/chat_templates/mistral-nemo.jinja: Mistral v3's form
without the spaces after [INST], [AVAILABLE_TOOLS], [TOOL_CALLS] and
[TOOL_RESULTS]), with the official `openai` client: the checks of
test_gateway_tools_mistral.py (a forced call with a 9-character id, a round
trip whose prompt and greedy answer equal those of the jinja2 rendering of
the real template, a 400 for a tool turn without tool_call_id) under
--chat-template mistral-nemo."""
import harness as H
import test_gateway_tools_mistral as M

if __name__ == "__main__":
    H.main(lambda h: M.run(h, "mistral-nemo"))
