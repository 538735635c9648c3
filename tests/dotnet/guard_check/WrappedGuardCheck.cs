// Test harness (tests/integration/test_torchsharp_instep.py), compiled with mcs against TestLoop.dll:
// the guard's one-line form. The stand-in's InStepTrainer runs PreStepGuard.Before at its optimizer's
// zero_grad() and step() (what TorchSharpGuard.Wrap / ModuleTrainer.Optimizer do on TorchSharp); not
// under optcheck, the guard throws PreStepCheckException. A bug is planted inside the trainer's own
// Step. Prints one "key value" line per fact.
//   WrappedGuardCheck.exe STEPS [BUG@STEP]
using System;
using System.Globalization;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheckTest;

public static class WrappedGuardCheck
{
    public static int Main(string[] args)
    {
        int steps = int.Parse(args[0], CultureInfo.InvariantCulture);
        string extra = "";
        if (args.Length > 1) {
            string[] b = args[1].Split('@');
            extra = ", \"extra\": {\"bug\": \"" + b[0] + "\", \"bug_at\": " + b[1] + "}";
        }
        var trainer = new InStepTrainer();
        trainer.Setup("{\"seed\": 1337, \"vocab_size\": 32, \"n_embd\": 8, \"lr\": 0.01" + extra + "}");
        const int B = 2, T = 8;
        var x = new long[B * T]; var y = new long[B * T];
        for (long step = 1; step <= steps; step++) {
            for (int i = 0; i < x.Length; i++) { x[i] = (i + step) % 32; y[i] = (i + step + 1) % 32; }
            try {
                trainer.Step(step, x, y, B, T);
            } catch (PreStepCheckException e) {
                GuardReport.Print(e, step);
                // the call the guard stopped, made without it: what TorchSharp (the stand-in) throws
                trainer.Optimizer.Before = null;
                GuardReport.Unguarded(() => { if (e.Call == "zero_grad()") trainer.Optimizer.ZeroGrad(); else trainer.Optimizer.Step(); });
                return 3;
            }
        }
        Console.WriteLine("clean " + steps);
        return 0;
    }
}
