"""Derender: a token-out engine answer back into an OpenAI answer, as vLLM 0.32's render server.

``pieces`` spells ids as vocabulary pieces and joins pieces into text (the tokenizer calls vLLM's
slow detokenizer makes); ``incremental`` is vLLM's incremental detokenization on them, with the
client-carried stream state; ``logprobs`` spells output logprobs; ``answers`` checks the derender
requests and shapes the answers.
"""
