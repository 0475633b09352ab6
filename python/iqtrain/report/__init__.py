"""Reading an attempt back (torch-free): the text report, plots and the TensorBoard export."""
