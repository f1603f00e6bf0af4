// Launcher starts de.bwaldvogel:mongo-java-server, a MongoDB wire-protocol
// server, for leasepool's tests: loopback only, oplog enabled (so change
// streams work), memory backend or, with --h2 FILE, the H2 backend whose
// data and oplog survive a clean restart (SIGTERM runs the shutdown hook,
// which closes the backend and so commits to the file).
//
// It reports MongoDB 4.4 (wire version 9): the server's own default is wire
// version 8, which go.mongodb.org/mongo-driver/v2 >= 2.9 refuses.
//
// Run with Java 17+ as tests/servers does, compiled once into CLASSES:
//
//	java -cp 'lib/*:CLASSES' Launcher --port 27017 [--h2 /path/to/file.mv]
//
// or as a single source file, compiled again at each start:
//
//	java -cp 'lib/*' Launcher.java --port 27017
//
// It prints "leasepool-test-mongo listening on 127.0.0.1:PORT" when ready.
//
// The oplog is indexed (IndexedOplog below): the server's own reads its
// whole oplog on every change stream's getMore, so a server slowed down as
// it aged and spent most of its CPU there (docs/performance.md, "Two
// lanes").
import de.bwaldvogel.mongo.MongoBackend;
import de.bwaldvogel.mongo.MongoCollection;
import de.bwaldvogel.mongo.MongoDatabase;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.AbstractMongoBackend;
import de.bwaldvogel.mongo.backend.Cursor;
import de.bwaldvogel.mongo.backend.CursorRegistry;
import de.bwaldvogel.mongo.backend.Utils;
import de.bwaldvogel.mongo.backend.aggregation.Aggregation;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import de.bwaldvogel.mongo.bson.BsonTimestamp;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.oplog.CollectionBackedOplog;
import de.bwaldvogel.mongo.oplog.Oplog;
import de.bwaldvogel.mongo.oplog.OplogCursor;
import de.bwaldvogel.mongo.oplog.OplogPosition;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.stream.Stream;

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
        MongoBackend backend = h2File == null ? new MemoryBackend() {
            @Override
            protected Oplog createOplog() {
                return IndexedOplog.of(this, getCursorRegistry());
            }
        } : new H2Backend(h2File) {
            @Override
            protected Oplog createOplog() {
                return IndexedOplog.of(this, getCursorRegistry());
            }
        };
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

/**
 * IndexedOplog is the server's CollectionBackedOplog, which writes the oplog
 * collection and makes the change events, with its reads indexed: it keeps
 * the oplog's entries by namespace, in timestamp order, and a change
 * stream's getMore walks back from the newest entry of its namespace to its
 * position instead of reading, filtering and sorting the whole oplog. The
 * entries it returns, and their order, are those the server's own read
 * returns: the entries of the stream's namespace and the commands ($cmd) of
 * its database, after the stream's position. An update's full document
 * (fullDocument: updateLookup) is looked up by its _id in the _id index,
 * where the server's own read the whole collection for each update.
 */
final class IndexedOplog implements Oplog {
    private final MongoBackend backend;
    private final CollectionBackedOplog base;
    private final Method toChangeStreamDocument;
    private final Field cursorStream;
    /** Entries by namespace, and commands by database; each in timestamp order. */
    private final Map<String, List<Document>> byNamespace = new HashMap<>();
    private final Map<String, List<Document>> commandsByDatabase = new HashMap<>();

    static IndexedOplog of(AbstractMongoBackend backend, CursorRegistry cursors) {
        MongoDatabase local = backend.resolveDatabase("local");
        MongoCollection<?> oplog = local.resolveCollection("oplog.rs", false);
        if (oplog == null) {
            oplog = local.createCollectionOrThrowIfExists("oplog.rs");
        }
        @SuppressWarnings("unchecked")
        MongoCollection<Document> collection = (MongoCollection<Document>) oplog;
        try {
            return new IndexedOplog(backend, collection, cursors);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("mongo-java-server's oplog is not the one IndexedOplog was written for", e);
        }
    }

    private IndexedOplog(MongoBackend backend, MongoCollection<Document> collection, CursorRegistry cursors)
            throws ReflectiveOperationException {
        this.backend = backend;
        toChangeStreamDocument = CollectionBackedOplog.class.getDeclaredMethod("toChangeStreamResponseDocument", Document.class, Document.class);
        toChangeStreamDocument.setAccessible(true);
        cursorStream = OplogCursor.class.getDeclaredField("oplogStream");
        cursorStream.setAccessible(true);
        // An H2 file's oplog survives a restart.
        collection.queryAllAsStream().forEach(this::add);
        // The base oplog writes through a view of the collection that
        // indexes each entry it adds.
        @SuppressWarnings("unchecked")
        MongoCollection<Document> indexing = (MongoCollection<Document>) Proxy.newProxyInstance(
            MongoCollection.class.getClassLoader(), new Class<?>[] {MongoCollection.class}, (proxy, method, args) -> {
                if (method.getName().equals("addDocuments")) {
                    // The base stamps each entry's timestamp as the stream
                    // is read: read, added and indexed under the index's
                    // lock, a read of the index never sees a later entry
                    // without the earlier ones, which would skip them.
                    synchronized (this) {
                        @SuppressWarnings("unchecked")
                        List<Document> docs = ((Stream<Document>) args[0]).toList();
                        collection.addDocuments(docs.stream());
                        docs.forEach(this::add);
                    }
                    return null;
                }
                try {
                    Object result = method.invoke(collection, args);
                    if (method.getName().equals("addDocument")) {
                        add((Document) args[0]);
                    }
                    return result;
                } catch (InvocationTargetException e) {
                    throw e.getCause();
                }
            });
        base = new CollectionBackedOplog(backend, indexing, cursors);
    }

    private static BsonTimestamp timestamp(Document entry) {
        return (BsonTimestamp) entry.get("ts");
    }

    private synchronized void add(Document entry) {
        String ns = (String) entry.get("ns");
        insert(byNamespace.computeIfAbsent(ns, k -> new ArrayList<>()), entry);
        if (Utils.getCollectionNameFromFullName(ns).equals("$cmd")) {
            insert(commandsByDatabase.computeIfAbsent(Utils.getDatabaseNameFromFullName(ns), k -> new ArrayList<>()), entry);
        }
    }

    /**
     * insert keeps entries in timestamp order: a collection's drop is
     * stamped before it is added (addDocument), outside the index's lock,
     * and may come after a later entry, as in the server's own oplog.
     */
    private static void insert(List<Document> entries, Document entry) {
        int i = entries.size();
        while (i > 0 && timestamp(entries.get(i - 1)).compareTo(timestamp(entry)) > 0) {
            i--;
        }
        entries.add(i, entry);
    }

    /** after returns the entries a stream on namespace reads after position, in timestamp order. */
    private synchronized List<Document> after(OplogPosition position, String namespace) {
        List<Document> out = new ArrayList<>();
        List<Document> commands = commandsByDatabase.get(Utils.getDatabaseNameFromFullName(namespace));
        tail(commands, position, out);
        // A command namespace's own entries are all among its database's commands.
        if (!Utils.getCollectionNameFromFullName(namespace).equals("$cmd")) {
            tail(byNamespace.get(namespace), position, out);
        }
        out.sort((a, b) -> timestamp(a).compareTo(timestamp(b)));
        return out;
    }

    private static void tail(List<Document> entries, OplogPosition position, List<Document> out) {
        if (entries == null) {
            return;
        }
        int i = entries.size();
        while (i > 0 && new OplogPosition(timestamp(entries.get(i - 1))).isAfter(position)) {
            i--;
        }
        out.addAll(entries.subList(i, entries.size()));
    }

    /**
     * changeStreamDocument is the change event of entry. The base makes it
     * with the update's delta as its full document (withoutLookup is the
     * stream's document less fullDocument, null when it asked for none),
     * and an update on a stream that asked for updateLookup then gets the
     * document as stored, if it still is.
     */
    private Document changeStreamDocument(Document entry, Document changeStream, Document withoutLookup) {
        Document event;
        try {
            event = (Document) toChangeStreamDocument.invoke(base, entry, withoutLookup == null ? changeStream : withoutLookup);
        } catch (InvocationTargetException e) {
            if (e.getCause() instanceof RuntimeException r) {
                throw r;
            }
            throw new IllegalStateException(e.getCause());
        } catch (IllegalAccessException e) {
            throw new IllegalStateException(e);
        }
        if (withoutLookup != null && "u".equals(entry.get("op"))) {
            String[] ns = ((String) entry.get("ns")).split("\\.");
            Object id = ((Document) entry.get("o2")).get("_id");
            for (Document stored : backend.resolveDatabase(ns[0]).resolveCollection(ns[1], true).handleQuery(new Document("_id", id))) {
                event.put("fullDocument", stored);
                break;
            }
        }
        return event;
    }

    @Override
    public void handleInsert(String namespace, List<Document> documents) {
        base.handleInsert(namespace, documents);
    }

    @Override
    public void handleUpdate(String namespace, Document selector, Document query, List<Object> modifiedIds) {
        base.handleUpdate(namespace, selector, query, modifiedIds);
    }

    @Override
    public void handleDelete(String namespace, Document query, List<Object> deletedIds) {
        base.handleDelete(namespace, query, deletedIds);
    }

    @Override
    public void handleDropCollection(String namespace) {
        base.handleDropCollection(namespace);
    }

    @Override
    public Cursor createCursor(Document changeStream, String namespace, Aggregation aggregation) {
        Cursor cursor = base.createCursor(changeStream, namespace, aggregation);
        if (cursor instanceof OplogCursor) {
            Document withoutLookup = null;
            if ("updateLookup".equals(changeStream.get("fullDocument"))) {
                withoutLookup = new Document(changeStream);
                withoutLookup.remove("fullDocument");
            }
            Document noLookup = withoutLookup;
            Function<OplogPosition, Stream<Document>> read = position -> aggregation.runStagesAsStream(
                after(position, namespace).stream().map(entry -> changeStreamDocument(entry, changeStream, noLookup)));
            try {
                cursorStream.set(cursor, read);
            } catch (IllegalAccessException e) {
                throw new IllegalStateException(e);
            }
        }
        return cursor;
    }
}
