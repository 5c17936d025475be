"""BRIDGE math as pure torch functions: no Ray, no I/O, nothing else from the package.

One module per concept, each function citing its paper equation:

- ``choices``        the named variants a config chooses among (no torch: the config imports it)
- ``aggregate``      token-loss reductions (token-mean, seq-mean-token-mean, seq-mean-token-sum, turn-mean)
- ``grpo``           group advantages and the clipped multi-turn surrogate (eq. grpo)
- ``kl``             KL-to-reference estimators k1/k2/k3 and entropy (eq. jrl)
- ``logprob``        token log-probs and teacher-forced answer likelihoods (Appendix A)
- ``retriever``      the top-k softmax with retrieval temperature (eq. retriever_distribution)
- ``rag``            RAG likelihood and its closed-form score gradient (eqs. lrag, app_retrieval_score_gradient)
- ``retrieval_rl``   retrieval credit and the document-level clipped surrogate
                     (eqs. app_retrieval_credit, app_retrieval_rl_loss)
- ``retriever_loss`` the combined retriever objective with weights 1/(1+γ), γ/(1+γ) (eq. eta_loss)
- ``estimators``     the bridge / drop / two-state theta-gradient estimators (Section 3.2)
"""
