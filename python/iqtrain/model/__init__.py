"""The model (torch): the next-patch transformer and its loss, prepare_iq_input (the Triton
kernel and its PyTorch reference), and the FLOP count and peak table behind MFU."""
