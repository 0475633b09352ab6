"""Evaluation of a pretrained model (torch): the linear probe."""
