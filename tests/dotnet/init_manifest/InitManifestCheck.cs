// Test harness (tests/unit/test_export_init.py): reads an optcheck.init/1 export with the worker's
// own reader (dotnet/Worker/InitManifest.cs) and prints, per tensor, what it read:
// "name<TAB>shape<TAB>count<TAB>first value (R)<TAB>sum (R)", or "error<TAB>message" for an
// ArgumentException. Exit 0 read, 3 rejected.
using System;
using System.Globalization;
using System.Linq;
using OptCheck.Worker;

public static class InitManifestCheck
{
    public static int Main(string[] args)
    {
        try {
            var entries = InitManifest.Read(args[0]);
            foreach (InitEntry e in entries.Values.OrderBy(x => x.File, StringComparer.Ordinal)) {
                float[] v = InitManifest.ReadFloats(args[0], e);
                double sum = 0;
                foreach (float f in v) sum += f;
                Console.WriteLine(e.Name + "\t" + InitManifest.ShapeText(e.Shape) + "\t" + v.Length + "\t" +
                                  ((double)v[0]).ToString("R", CultureInfo.InvariantCulture) + "\t" +
                                  sum.ToString("R", CultureInfo.InvariantCulture));
            }
            return 0;
        } catch (ArgumentException e) {
            Console.WriteLine("error\t" + e.Message);
            return 3;
        }
    }
}
