"""Background work: procrastinate jobs (launch, deliver an answer, deliver a cancel, sweeps) and the tracker."""
