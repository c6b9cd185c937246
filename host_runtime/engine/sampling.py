"""Per-request sampling: parameters, the llama.cpp sampler chain, and logprobs."""

from __future__ import annotations

import numpy as np

from host_runtime.common.errors import InputError
from host_runtime.engine.wire import MAX_GRAMMAR_BYTES, SamplingParams  # noqa: F401  (the wire's; read here)


DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed




class GrammarRejected(InputError, ValueError):
    """llama.cpp could not compile the grammar (it logs why and returns NULL), or it is past MAX_GRAMMAR_BYTES."""


def _grammar_sampler(model, grammar: str):
    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        raise GrammarRejected("llama.cpp refused the grammar made from this schema")
    return sampler


class CompiledGrammar:
    """A grammar parsed once, on the thread that submits the request (never the engine's loop thread): a grammar
    llama.cpp refuses (NULL, which must never reach a sampler chain) or a large one is settled there. Each choice's
    sampler chain gets a copy (llama_sampler_clone copies the parsed rules and stacks; it parses nothing)."""

    def __init__(self, model, grammar: str):
        size = len(grammar.encode("utf-8"))
        if size > MAX_GRAMMAR_BYTES:
            raise GrammarRejected(f"the grammar is {size} bytes; the engine compiles at most {MAX_GRAMMAR_BYTES}")
        self._sampler = _grammar_sampler(model, grammar)

    def copy(self):
        """A new grammar sampler in the parsed state, owned by whoever adds it to a chain."""
        import llama_cpp

        return llama_cpp.llama_sampler_clone(self._sampler)

    def close(self) -> None:
        if self._sampler:
            import llama_cpp

            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit llama_cpp may be gone before us
            pass


def build_sampler_chain(model, params: SamplingParams, choice_index: int = 0, grammar: CompiledGrammar | None = None):
    """A fresh llama.cpp sampler chain for one sequence; it owns its RNG and penalty state. `grammar`: the request's
    compiled `params.grammar` (Engine.submit compiles it)."""
    import llama_cpp
    from llama_cpp._internals import LlamaSampler

    chain = LlamaSampler()
    if params.grammar:
        if grammar is None:
            raise GrammarRejected("a grammar reached the sampler chain uncompiled")
        llama_cpp.llama_sampler_chain_add(chain.sampler, grammar.copy())
    if params.logit_bias:
        chain.add_logit_bias(model.n_vocab(), {int(t): b for t, b in params.logit_bias.items()})
    if params.presence_penalty or params.frequency_penalty:
        chain.add_penalties(
            model.n_vocab(),
            penalty_last_n=64,
            penalty_repeat=1.0,
            penalty_freq=params.frequency_penalty,
            penalty_present=params.presence_penalty,
        )
    if params.greedy:
        chain.add_greedy()
    else:
        if params.top_p < 1.0:
            chain.add_top_p(params.top_p, 1)
        chain.add_temp(params.temperature)
        seed = DEFAULT_SEED if params.seed is None else (params.seed + choice_index) & 0xFFFFFFFF
        chain.add_dist(seed)
    return chain


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """Log-probability of `token` under the model's raw distribution, and the top `top_n` alternatives."""
    logits = logits.astype(np.float64, copy=False)
    peak = logits.max()
    log_z = peak + np.log(np.exp(logits - peak).sum())
    chosen = float(logits[token] - log_z)
    if top_n <= 0:
        return chosen, []
    top = np.argpartition(-logits, top_n - 1)[:top_n]
    top = top[np.argsort(-logits[top])]
    return chosen, [(int(t), float(logits[t] - log_z)) for t in top]
