"""Training a run: plan it (``plan``), build its model and compiled step (``step``), and train it epoch by epoch
(``loop``), with its schedules, resume points and stop rules each in a module of its own.

Nothing is imported here: ``textgen.training.plan`` needs no TensorFlow, and importing the package must not
pull it in.
"""
