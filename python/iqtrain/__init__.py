"""iqtrain: compiled next-patch-prediction pretraining on IQ radio recordings."""
