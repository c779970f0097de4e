"""On-policy distillation (OPD): a teacher's log-probs of the student's own tokens shape its advantages.

slime's ``--use-opd`` (docs/algorithms.md, "On-policy distillation"): the student samples, a
teacher scores every sampled token, and each token's advantage from the ordinary estimator (GRPO,
PPO, ...) is lowered by the per-token reverse-KL estimate

    A_t <- A_t - opd_kl_coef * (log p_student(y_t) - log p_teacher(y_t))

where ``p_student`` is the policy that sampled (p0, the trainer's old log-probs) and the token is
the student's. It is the k1 estimate of KL(student || teacher) at that token, so tokens the
teacher finds likelier than the student are pushed up, the others down. ``opd_reverse_kl`` (its
masked mean) is logged under slime's name.

Where the teacher's log-probs come from (``--opd-type``, slime's names):

* ``sglang``: a teacher served by an engine at ``--rm-url`` (``rlvr serve`` or SGLang), asked for
  the input log-probs of prompt + response with zero new tokens (``rlvr.train.teacher.ServedTeacher``).
* ``megatron``: a teacher loaded in the trainer process from ``--opd-teacher-load``
  (a Hugging Face directory here; ``rlvr.train.teacher.LoadedTeacher``).

Samples whose teacher request failed carry no teacher signal: their OPD term is zero (the
trainer counts them in ``train/opd_teacher_failures``).
"""

from __future__ import annotations

import torch  # noqa: F401 (doctest)
from torch import Tensor

from rlvr.config.algo import OPD_TYPES  # noqa: F401 (re-exported)


def opd_advantages(advantages: Tensor, student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor,
                   coef: float) -> tuple[Tensor, Tensor]:
    """``(advantages - coef * reverse_kl, reverse_kl)``, all [B, T]; ``reverse_kl`` is
    ``(log p_student - log p_teacher) * mask`` (``mask`` zero where there is no teacher signal:
    padding, tokens outside the loss, samples whose teacher failed).

    >>> adv, kl = opd_advantages(torch.tensor([[1.0, 1.0]]), torch.tensor([[-1.0, -2.0]]),
    ...                          torch.tensor([[-0.5, -3.0]]), torch.tensor([[1.0, 0.0]]), 2.0)
    >>> adv.tolist(), kl.tolist()
    ([[2.0, 1.0]], [[-0.5, 0.0]])
    """
    reverse_kl = (student_log_probs.float() - teacher_log_probs.float()) * mask
    return advantages - coef * reverse_kl, reverse_kl


