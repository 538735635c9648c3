// A plain .NET training loop with no optcheck run and no Python (tests/torchsharp_real/test_real_own_trainer.py):
// the user's TinyLm and AdamW, the optimizer wrapped once with TorchSharpGuard.Wrap, a bug planted inside
// the step (Bugs.Plant). Run on CoreCLR with real TorchSharp: `dotnet exec --runtimeconfig rc.json
// GuardLoop.exe STEPS [BUG@STEP]`. Prints one "key value" line per fact; exit 3 when the guard stopped a call.
using System;
using System.Globalization;
using System.Linq;
using OptCheck.Contract;
using OptCheckReal;
using TorchSharp;
using static TorchSharp.torch;

public static class GuardLoop
{
    public static int Main(string[] args)
    {
        int steps = int.Parse(args[0], CultureInfo.InvariantCulture);
        string bug = "";
        long at = -1;
        if (args.Length > 1) {
            string[] b = args[1].Split('@');
            bug = b[0];
            at = long.Parse(b[1], CultureInfo.InvariantCulture);
        }
        torch.manual_seed(1);
        torch.set_num_threads(1);
        Console.WriteLine("torchsharp " + typeof(torch).Assembly.GetName().Version);
        const int B = 4, T = 16, V = 64;
        var model = new TinyLm(V, 32, T);
        optim.Optimizer inner = Bugs.Eager(bug) ? torch.optim.AdamW(model.parameters().ToList(), 3e-3)
                                                : torch.optim.AdamW(model.parameters(), 3e-3);
        optim.Optimizer optimizer = TorchSharpGuard.Wrap(model, inner);   // the one line
        var x = new long[B * T];
        var y = new long[B * T];
        double first = double.NaN, last = double.NaN;
        for (long step = 1; step <= steps; step++) {
            for (int i = 0; i < x.Length; i++) { x[i] = (i * 7 + step) % V; y[i] = (i * 7 + step + 1) % V; }
            // the whole step in one DisposeScope, as users write it; the guard's exception is caught inside it
            // (a Parameter made inside the scope is disposed when it ends)
            using (torch.NewDisposeScope()) {
                string call = "";
                try {
                    if (step == at && Bugs.BeforeZeroGrad(bug)) Bugs.Plant(model, bug);
                    call = "zero_grad()";
                    optimizer.zero_grad();
                    Tensor loss = model.Loss(x, y, B, T);
                    loss.backward();
                    if (step == at && !Bugs.BeforeZeroGrad(bug)) Bugs.Plant(model, bug);
                    call = "step()";
                    optimizer.step();
                    last = loss.to(ScalarType.Float64).item<double>();
                    if (step == 1) first = last;
                } catch (PreStepCheckException e) {
                    GuardReport.Print(e, step);
                    // the same call made on the optimizer itself: what TorchSharp throws there
                    GuardReport.Unguarded(() => { if (call == "zero_grad()") inner.zero_grad(); else inner.step(); });
                    return 3;
                }
            }
        }
        Console.WriteLine("clean " + steps);
        Console.WriteLine("loss " + first.ToString("R", CultureInfo.InvariantCulture) + " " + last.ToString("R", CultureInfo.InvariantCulture));
        return 0;
    }
}
