"""PropProof, propositional proofs by tactics checked by the project (not Lean): the env (env.py),
formulas, checker, prover (the expert) and theorem generator."""
