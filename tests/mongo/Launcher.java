// Launcher starts de.bwaldvogel:mongo-java-server, a MongoDB wire-protocol
// server, for leasepool's tests: loopback only, oplog enabled (so change
// streams work), memory backend or, with --h2 FILE, the H2 backend whose
// data and oplog survive a clean restart (SIGTERM runs the shutdown hook,
// which closes the backend and so commits to the file).
//
// It reports MongoDB 4.4 (wire version 9): the server's own default is wire
// version 8, which go.mongodb.org/mongo-driver/v2 >= 2.9 refuses.
//
// Run with Java 17+ as a single source file:
//
//	java -cp 'lib/*' Launcher.java --port 27017 [--h2 /path/to/file.mv]
//
// It prints "leasepool-test-mongo listening on 127.0.0.1:PORT" when ready.
import de.bwaldvogel.mongo.MongoBackend;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

import java.util.List;

public class Launcher {
    /** The version reported to clients in hello and buildInfo. */
    static final MongoVersion VERSION = new MongoVersion() {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(4, 4, 0);
        }

        @Override
        public int getWireVersion() {
            return 9;
        }
    };

    public static void main(String[] args) {
        int port = 27017;
        String h2File = null;
        String host = "127.0.0.1";
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--port" -> port = Integer.parseInt(value(args, ++i));
                case "--h2" -> h2File = value(args, ++i);
                case "--host" -> host = value(args, ++i);
                default -> usage("unknown argument " + args[i]);
            }
        }
        MongoBackend backend = h2File == null ? new MemoryBackend() : new H2Backend(h2File);
        backend.version(VERSION);
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("leasepool-test-mongo shutting down");
            server.shutdown();
            backend.close();
            System.out.println("leasepool-test-mongo stopped");
        }, "shutdown"));
        server.bind(host, port);
        System.out.println("leasepool-test-mongo listening on " + host + ":" + port
                + (h2File == null ? " (memory)" : " (h2 " + h2File + ")"));
    }

    static String value(String[] args, int i) {
        if (i >= args.length) {
            usage(args[i - 1] + " needs a value");
        }
        return args[i];
    }

    static void usage(String msg) {
        System.err.println("Launcher: " + msg);
        System.err.println("usage: java -cp 'lib/*' Launcher.java --port N [--h2 FILE] [--host ADDR]");
        System.exit(2);
    }
}
