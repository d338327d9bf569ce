"""The Jinja sandbox chat templates render in: renderer, environment, syntax, budget."""
