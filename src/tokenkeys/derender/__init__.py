"""Derender: a token-out engine answer back into an OpenAI answer, as vLLM 0.32's render server.

``token_out`` holds what a derender request carries (vLLM's token-out answers, the client-carried
stream state); ``pieces`` spells ids as vocabulary pieces and joins pieces into text (the
tokenizer calls vLLM's slow detokenizer makes); ``incremental`` is vLLM's incremental
detokenization on them, with that stream state; ``logprobs`` spells output logprobs; ``answers``
checks the derender requests and shapes the answers.
"""
