"""What the real-vLLM checks ask the models for: the prompts and the completion length. Standard
library only: the checks (the project's venv) send them, and build_mtp_model.py (the e2e venv)
replays them to tune the chain-breaking head on the drafts the server will make."""

# Repetitive prompts in the corpus's own words: the target continues them in loops,
# which ngram drafting finds in the context.
PROMPTS = [
    "the cat sees the red ball in the morning . the cat sees the red ball",
    "a dog likes a green box and a dog likes a green box again . a dog",
    "by the sea , my sister paints the quiet river . by the sea , my sister",
    "the robot follows an empty cup at night . the robot follows an empty cup",
    "our neighbour carries the tall tree after lunch . our neighbour carries",
    "in the garden , the teacher watches a bright star . in the garden ,",
]
MTP_MAX_TOKENS = 48  # each greedy completion of the MTP incident's steady load
